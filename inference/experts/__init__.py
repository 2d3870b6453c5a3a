"""Expert streaming: the routed experts of each MoE layer come from NVMe into a few cache slots.

- `stream`: `StreamingExperts.run`, a layer's expert phase: hits, misses read into cache slots and
  computed as they land, the shared work while the reads are in flight;
- `cache`: the per-layer slots and the eviction policy (LFU, LRU); `io`: the reads (io_uring, preadv);
- `landing`: a landed read's digest check and in-slot repacking, and the idle-time digest checks;
- `lookahead`: the next layer's experts read ahead (a prompt's pools, a token's scored guesses);
  `lending`: the cache slots finished layers lend a prompt's lookahead;
- `popularity`: request counts kept across restarts, to warm the caches;
- `resident`: `ResidentExperts`, every expert memory-mapped or repacked in memory (no budget).

The math is the caller's (`moe.mixture`); its results do not depend on the order experts arrive in or on
how they are grouped, so every cache setting gives the same bits as the all-resident run.
"""

from .landing import VERIFY_MODES
from .lookahead import TOKEN_PREFETCH, lookahead_pools
from .resident import ResidentExperts
from .stream import StreamingExperts

__all__ = ["TOKEN_PREFETCH", "VERIFY_MODES", "ResidentExperts", "StreamingExperts", "lookahead_pools"]
