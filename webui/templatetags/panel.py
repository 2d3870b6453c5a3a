"""Template helpers of the admin panel: sizes, percentages and the memory-budget bar."""

from __future__ import annotations

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()

# the memory budget's parts in the bar's order (`appliance.events.MemoryBudget`), with their labels
MEMORY_PARTS = (
    ("dense", "dense"),
    ("kv", "KV"),
    ("expert_slots", "expert slots"),
    ("prefetch_slots", "prefetch"),
    ("runtime", "runtime"),
    ("free", "free"),
)


@register.filter
def bytes_h(n) -> str:
    """1536 → "1.5 KiB"."""
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@register.filter
def percent(x) -> str:
    return "—" if x is None else f"{100 * float(x):.0f} %"


@register.simple_tag
def membar(memory) -> str:
    """The stacked bar of a `MemoryBudget`: one span per part, its width its share of the budget in whole
    percents, as a class (`panel.css`: the page's Content-Security-Policy allows no style attributes)."""
    whole = memory.total or sum(getattr(memory, k) for k, _ in MEMORY_PARTS) or 1
    parts = [(k, label, getattr(memory, k)) for k, label in MEMORY_PARTS if getattr(memory, k)]
    return format_html_join(
        "",
        '<span class="mem mem-{} w{}" title="{}: {}"></span>',
        ((k, min(100, round(100 * v / whole)), label, bytes_h(v)) for k, label, v in parts),
    ) or format_html('<span class="muted">no memory figures</span>')
