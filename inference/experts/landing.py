"""Landing a read: the expert's digest check, then (once `repacked`) its repacking in the slot it landed in.

Contract: `Landing.land` touches only the slot memory it is given and adds to `verified`, so it runs on any
thread: a lander thread for a demand read (while the engine computes the experts landed before it), the
reader thread for a lookahead read. A read whose landing is only making its views (digest checked already
or never, nothing to repack) is landed by the caller itself (`Landing.submit`): waking a lander thread
would cost more than the work. `check_unchecked` checks, while the engine is idle, the digests no read has
checked yet, so that the first prompt after a load trusts them.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..errors import ModelFormatError
from ..kernels.repack import as_repacked, repack_expert, repackable_kind
from ..options import OptionError
from ..store.format import digest_bytes
from .io import LayerFiles, ReadRequest

log = logging.getLogger(__name__)

VERIFY_MODES = ("off", "first", "always")
LAND_WORKERS = 2  # threads that check and repack demand reads as they land
GROUP_MAX = 8  # experts landed together computed in one call, at most (a call's temporaries grow with it)


def stored_repacked(lay) -> bool:
    """Whether a layer's experts are stored repacked (`rkmojo repack`): nothing to repack where they land."""
    return not any(repackable_kind(spec["kind"], spec["shape"]) for spec in lay.tensors.values())


class Landing:
    """Digest checks and in-slot repacking of landed reads, for every MoE layer of `store`.

    Args:
        store: the opened store.
        verify: digest check of blobs: "off", "first" (first load of each blob) or "always".

    Raises:
        OptionError: `verify` is not one of VERIFY_MODES.
    """

    def __init__(self, store, verify: str):
        if verify not in VERIFY_MODES:
            raise OptionError("verify_experts", verify, f"one of {', '.join(VERIFY_MODES)}")
        self.store = store
        self.layouts = store.expert_layers
        self.verify = verify
        self.verified: set[tuple[int, int]] = set()
        self.mismatched: set[tuple[int, int]] = set()  # found bad by `check_unchecked`: not tried again
        self.repacked = False  # experts repacked in their slots as they land (`StreamingExperts.repack_experts`)
        self._stored_repacked = {layer: stored_repacked(lay) for layer, lay in self.layouts.items()}
        self.lander = ThreadPoolExecutor(max_workers=LAND_WORKERS, thread_name_prefix="rkmojo-land")

    def view(self, layer: int, buf: np.ndarray) -> dict:
        """The expert in slot memory `buf` (landed: see `land`)."""
        w = self.layouts[layer].view(buf)
        return as_repacked(w) if self.repacked else w

    def check(self, r: ReadRequest) -> None:
        """The digest check of a completed read, as `verify` asks.

        Raises:
            ModelFormatError: the blob's digest is not the manifest's.
        """
        lay = self.layouts[r.layer]
        if self.verify == "off" or (self.verify == "first" and (r.layer, r.expert) in self.verified):
            return
        if digest_bytes(r.dest[: lay.blob_size]).hexdigest() != lay.digests[r.expert]:
            raise ModelFormatError(
                f"{self.store.path}: experts/layer_{r.layer:02d}.bin expert {r.expert} digest mismatch; "
                "re-run `rkmojo pull` or `rkmojo convert`"
            )
        self.verified.add((r.layer, r.expert))

    def land(self, r: ReadRequest, buf: np.ndarray) -> dict:
        """A completed read into `buf`: its digest check, then (`repacked`) its repacking in place; the
        expert's views."""
        self.check(r)
        w = self.layouts[r.layer].view(buf)
        return repack_expert(w, in_place=True) if self.repacked else w

    def landed(self, buf: np.ndarray, r: ReadRequest) -> tuple[ReadRequest, dict]:
        """`land` as a reader's `then` callback: (the request, the expert's views)."""
        return r, self.land(r, buf)

    def nothing_to_repack(self, layer: int) -> bool:
        """Whether a read of `layer` lands without a repack: none asked for, or the store holds it repacked."""
        return not self.repacked or self._stored_repacked[layer]

    def lands_free(self, r: ReadRequest) -> bool:
        """Whether landing `r` is only making its views: its digest is checked already (or never) and
        nothing is repacked."""
        checked = self.verify == "off" or (self.verify == "first" and (r.layer, r.expert) in self.verified)
        return checked and self.nothing_to_repack(r.layer)

    def submit(self, r: ReadRequest, buf: np.ndarray) -> Future:
        """Land `r` on a lander thread, or at once on the calling thread when that is only making views."""
        if self.lands_free(r):
            fut: Future = Future()
            fut.set_result(self.land(r, buf))
            return fut
        return self.lander.submit(self.land, r, buf)

    def check_unchecked(self, files: LayerFiles, seconds: float) -> int:
        """Check the digests of experts that no read has checked yet, in store order, for about `seconds`
        (at least one expert per call); returns how many are left to check. Call while no generation runs.

        With `verify` "first", an expert is checked on its first read and trusted after; checked here, a
        prompt's first reads of it are trusted too. Each expert is read through the buffered file into
        memory of its own, its pages dropped after, so no slot or cache changes. An expert whose digest does
        not match stays unchecked and is not tried again: the prompt that reads it fails with the usual
        message. Nothing to check with `verify` "off" or "always"."""
        if self.verify != "first":
            return 0
        t0, left, checked = time.perf_counter(), 0, 0
        for layer, lay in self.layouts.items():
            for e in range(lay.n_experts):
                if (layer, e) in self.verified or (layer, e) in self.mismatched:
                    continue
                if left or (checked and time.perf_counter() - t0 >= seconds):
                    left += 1
                    continue
                fd = files.buffered[layer]
                blob = os.pread(fd, lay.blob_size, e * lay.stride)
                os.posix_fadvise(fd, e * lay.stride, lay.blob_size, os.POSIX_FADV_DONTNEED)
                if digest_bytes(blob).hexdigest() == lay.digests[e]:
                    self.verified.add((layer, e))
                else:
                    self.mismatched.add((layer, e))
                    log.error(
                        "%s: experts/layer_%02d.bin expert %d digest mismatch; re-run `rkmojo pull` or `rkmojo convert`",
                        self.store.path,
                        layer,
                        e,
                    )
                checked += 1
        return left

    def close(self) -> None:
        self.lander.shutdown(wait=True)
