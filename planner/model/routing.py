"""Where a token's routed copies land: the spread a router gives them over the expert-parallel ranks."""
from __future__ import annotations

import math


def contiguous_spread(num_experts: int, topk: int, ep: int, ranks_per_node: int) -> tuple[float, float]:
    """(E[distinct ranks], E[distinct nodes]) a token's ``topk`` experts sit on when token ``t`` takes experts
    ``t*topk .. t*topk + topk - 1`` mod ``num_experts`` (NeMo AutoModel's ``FakeBalancedGate``), the experts split
    into ``ep`` equal contiguous shares by EP rank and ``ranks_per_node`` consecutive EP ranks to a node or NVLink
    domain (0: the group inside one). ``t*topk`` mod the experts runs over the multiples of ``gcd(topk, experts)``
    equally often, so the mean over those starting experts is exact for a batch of whole cycles."""
    per_rank = num_experts // ep
    starts = range(0, num_experts, math.gcd(topk, num_experts))
    ranks = nodes = 0
    for s in starts:
        held = {((s + j) % num_experts) // per_rank for j in range(topk)}
        ranks += len(held)
        nodes += len({r // ranks_per_node for r in held}) if ranks_per_node else 1
    return ranks / len(starts), nodes / len(starts)


def missed_share(experts: int, share: int, topk: int) -> float:
    """Chance a token's ``topk`` distinct experts, picked uniformly among ``experts``, miss a given ``share`` of
    them: ``C(experts - share, topk) / C(experts, topk)`` (hypergeometric)."""
    return math.comb(experts - share, topk) / math.comb(experts, topk)


def uniform_ranks(ep: int, topk: int, experts: int = 0) -> float:
    """E[distinct ranks] a token's ``topk`` experts sit on when it picks them uniformly over ``ep`` equal shares (a
    trained router, or Megatron-Core's forced balancing, which draws random logits): ``topk`` distinct experts of
    ``experts``, so a rank holds none of them with the chance ``missed_share`` of its ``experts / ep``; without the
    expert count (or shares that do not divide it), the limit of many experts, ``ep (1 - (1 - 1/ep)^topk)``."""
    if experts and experts % ep == 0 and topk <= experts:
        return ep * (1 - missed_share(experts, experts // ep, topk))
    return ep * (1 - (1 - 1 / ep) ** topk)
