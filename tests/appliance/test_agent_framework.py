"""pydantic-ai end to end against the OpenAI endpoint: an agent with a tool, and structured output.

`Agent(OpenAIChatModel(name, provider=OpenAIProvider(base_url, api_key)), output_type=Model, tools=[…])`
is what a user writes; pydantic-ai then sends the tools (its output type as the `final_result` tool
unless told otherwise), `tool_choice`, tool results and retries over /v1/chat/completions (and over
/v1/responses with `OpenAIResponsesModel`).

The 135M demo model would rather not call tools: the tool-using run forces the tool on its first step
and the output tool on the next, per step, as pydantic-ai's documentation says to (a capability's
`get_model_settings` returning a callable), so the run takes the same path every time.
"""

from dataclasses import dataclass

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider


class Reading(BaseModel):
    room: str = Field(max_length=40)
    celsius: float = Field(ge=-50, le=60)


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


THERMOMETERS = {"kitchen": 21.5, "bedroom": 18.0}
SEEN: list[str] = []


def read_thermometer(room: str) -> float:
    """The temperature in a room of the house, in degrees Celsius.

    Args:
        room: kitchen or bedroom
    """
    SEEN.append(room)
    return THERMOMETERS.get(room.strip().lower(), 20.0)


@dataclass
class ToolThenOutput(AbstractCapability):
    """The run's first step must call `tool`, the next ones the output tool."""

    tool: str

    def get_model_settings(self):
        return lambda ctx: {"tool_choice": [self.tool] if ctx.run_step <= 1 else ["final_result"]}


def provider(stack) -> OpenAIProvider:
    return OpenAIProvider(base_url=f"{stack.url}/v1", api_key=stack.key)


SETTINGS = {"temperature": 0, "max_tokens": 200, "parallel_tool_calls": False}  # the tiny model would go on calling


def thermometer_agent(model) -> Agent:
    """An agent that reads a thermometer and answers with a Reading: the tool first, then the output tool."""
    SEEN.clear()
    capabilities = [ToolThenOutput("read_thermometer")]
    return Agent(
        model, output_type=Reading, tools=[read_thermometer], capabilities=capabilities, model_settings=SETTINGS
    )


@pytest.mark.slow
def test_an_agent_calls_its_tool_and_returns_the_output_object(stack):
    result = thermometer_agent(OpenAIChatModel("smollm2", provider=provider(stack))).run_sync(
        "How warm is it in the kitchen?"
    )
    assert isinstance(result.output, Reading)
    calls = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolCallPart)]
    returns = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert calls[0].tool_name == "read_thermometer" and isinstance(calls[0].args_as_dict()["room"], str)
    assert SEEN and returns[0].tool_name == "read_thermometer" and isinstance(returns[0].content, float)
    assert calls[-1].tool_name == "final_result"


@pytest.mark.slow
def test_an_agent_with_native_structured_output_returns_the_object(stack):
    """NativeOutput: the output type goes as `response_format` json_schema, the answer parsed from the text."""
    agent = Agent(
        OpenAIChatModel("smollm2", provider=provider(stack)),
        output_type=NativeOutput(City),
        model_settings=SETTINGS,
    )
    result = agent.run_sync("Name the capital of France and its country.")
    assert isinstance(result.output, City) and result.output.name


@pytest.mark.slow
def test_an_agent_on_the_responses_api_returns_the_output_object(stack):
    """The same agent over /v1/responses (`OpenAIResponsesModel`), its output type a tool there too."""
    agent = thermometer_agent(OpenAIResponsesModel("smollm2", provider=provider(stack)))
    result = agent.run_sync("How warm is it in the bedroom?")
    assert isinstance(result.output, Reading) and SEEN
