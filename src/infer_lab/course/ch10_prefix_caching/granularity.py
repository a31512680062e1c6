"""Section 1 of chapter 10: match granularity, measured (the notebook's ``tokens_reused``), with the typo argument."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from ...engine.prefix_cache import RadixPrefixCache
from ...progress import progress
from ...units import count
from ..library_code import code_block
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import CACHES, NUMBER, Sizes


@dataclass(frozen=True)
class MatchPoint:
    """Prompt tokens one cache handed the second request when the two prompts share ``shared_tokens``."""

    cache: str
    shared_tokens: int
    reused_tokens: int


@dataclass(frozen=True)
class MatchResult:
    block_size: int  # tokens per KV block
    prompt_len: int  # tokens of each of the two prompts
    points: list[MatchPoint]

    def reused(self, cache: str, shared: int) -> int:
        return next(p.reused_tokens for p in self.points if p.cache == cache and p.shared_tokens == shared)

    def shared_values(self) -> list[int]:
        return sorted({p.shared_tokens for p in self.points})

    def whole_blocks(self, shared: int) -> int:
        """Tokens in the whole blocks of a ``shared``-token prefix."""
        return shared // self.block_size * self.block_size

    def granularity(self, cache: str) -> str:
        """``"token"`` when the cache reused every shared token, ``"block"`` when it reused
        exactly the whole blocks of each shared prefix, ``"other"`` otherwise (measured, not assumed)."""
        points = [p for p in self.points if p.cache == cache]
        if all(p.reused_tokens == p.shared_tokens for p in points):
            return "token"
        if all(p.reused_tokens == self.whole_blocks(p.shared_tokens) for p in points):
            return "block"
        return "other"


def shared_lengths(block_size: int, prompt_len: int) -> list[int]:
    """0, 1 and one token either side of every block edge inside the prompt: where a staircase shows."""
    edges = range(block_size, prompt_len, block_size)
    return sorted({0, 1, *(k + d for k in edges for d in (-1, 0, 1))} & set(range(prompt_len)))


def predicted_reuse(cache: str, shared: int, block_size: int, prompt_len: int) -> int:
    """The prediction: radix reuses every shared token, hash the whole blocks of the shared prefix;
    both stop before the prompt's last token (it must be computed to give the first output's logits)."""
    usable = min(shared, prompt_len - 1)
    return usable if cache == "radix" else usable // block_size * block_size


def match_result(block_size: int, prompt_len: int, reused: Mapping[tuple[str, int], int]) -> MatchResult:
    """The experiment cell's ``{(cache, shared tokens): tokens reused}`` as a :class:`MatchResult`."""
    return MatchResult(block_size, prompt_len, [MatchPoint(cache, k, int(n)) for (cache, k), n in reused.items()])


def run_granularity(lm: Any, sizes: Sizes, block_size: int | None = None, shared: Seq[int] | None = None) -> MatchResult:
    """Run the notebook's own experiment (``tokens_reused`` of ``infer_lab/notebooks/10_prefix_caching.py``)
    as its cell does: every cache, every shared length (default :func:`shared_lengths`)."""
    tokens_reused = notebook_function(NUMBER, "tokens_reused")
    block_size = block_size or sizes.match_block
    prompt_len = sizes.match_blocks * block_size
    ks = list(shared) if shared is not None else shared_lengths(block_size, prompt_len)
    plan = [(cache, k) for cache in CACHES for k in ks]
    reused = {(cache, k): tokens_reused(lm, cache, block_size, prompt_len, k)
              for cache, k in progress(plan, desc="prefix match, per cache and shared length")}
    return match_result(block_size, prompt_len, reused)


# Cited, not measured: SGLang's radix cache as of SGLang 0.5.23 (PyPI wheel), read in its source.
# ``RadixCache.match_prefix`` (``srt/mem_cache/radix_cache.py``) truncates the key to a whole number
# of pages (``key.page_aligned(page_size)``) and matches page by page when ``page_size`` > 1;
# ``--page-size`` defaults to 1 token (``srt/arg_groups/overrides.py``, ``_page_size_default``; 64 on
# MUSA), and some attention backends force a size (``_mla_backend_page_constraints``, ``_fa4_page_constraint``).
SGLANG_VERSION = "0.5.23"
SGLANG_DEFAULT_PAGE_SIZE = 1  # tokens per KV page, --page-size's default
SGLANG_FORCED_PAGE_SIZES = {  # attention backend -> the page sizes (tokens) it accepts
    "FlashMLA": (64,),
    "TensorRT-LLM MHA": (16, 32, 64, 128),
    "FA4 on Blackwell (non-MLA models)": (128,),
}


def granularity_note(block_size: int) -> str:
    """Tree vs hash table and matching granularity, kept apart (markdown; SGLang's facts cited from
    :data:`SGLANG_VERSION`'s source, ``block_size`` the experiment's KV block in tokens)."""
    forced = "; ".join(f"{name}: {', '.join(map(str, sizes))}" for name, sizes in SGLANG_FORCED_PAGE_SIZES.items())
    return (
        "**Two separate choices.** The *lookup structure*, a table of block hashes or a tree over token "
        "ids, decides how a cache finds a prefix and how it stores branches. The *granularity*, whether a "
        "hit may end at any token or only on a block edge, is set by how the K/V memory is cut into blocks "
        "(pages). This engine's radix tree hits at any token because, when a prefix ends inside a block, "
        "it copies that block's matching part into a fresh block (copy-on-write): a design of this course. "
        f"SGLang {SGLANG_VERSION} matches token by token only because its KV page size defaults to "
        f"{count(SGLANG_DEFAULT_PAGE_SIZE, 'token')}; with `--page-size` above that, `RadixCache.match_prefix` "
        "cuts the prompt to whole pages and matches page by page, like vLLM's blocks, and some attention "
        f"backends force a page size (in tokens, {forced}). The experiment below uses {block_size}-token "
        "blocks; set `block_size = 1` in its cell and the hash table reuses every shared token too."
    )


def typo_position(sizes: Sizes) -> int:
    """Where the page's typo example puts its typo (0-based token): the middle of the system prompt's
    last whole block, so the typo sits inside a block."""
    whole_blocks = sizes.system_len // sizes.block_size
    if whole_blocks == 0:
        return sizes.system_len // 2
    return (whole_blocks - 1) * sizes.block_size + sizes.block_size // 2


def typo_reuse(prompt_len: int, block_size: int, typo_at: int) -> dict[str, int]:
    """Prompt tokens each cache can hand back when a prompt equals a cached one except at token
    ``typo_at`` (0-based) and after: the prefix before the typo, in whole blocks for hash."""
    return {cache: predicted_reuse(cache, typo_at, block_size, prompt_len) for cache in CACHES}


def typo_text(prompt_len: int, block_size: int, typo_at: int) -> str:
    """The workshop talk's argument for a radix tree (typos), checked with :func:`typo_reuse` (markdown)."""
    reuse = typo_reuse(prompt_len, block_size, typo_at)
    after = prompt_len - typo_at
    if reuse["radix"] > reuse["hash"]:
        tree = (f"The tree keeps the {reuse['radix'] - reuse['hash']} tokens between the last block edge and "
                "the typo; that is all it adds.")
    else:
        tree = "Here the typo sits on a block edge, so both get the same back."
    return (
        "**The talk's reason for a radix tree, checked.** Talk 1 (the workshop) motivated the radix tree by "
        "typos: with hashed prefixes, \"sometimes we type and make a small kind of mistake\" and the cache "
        f"misses. A typo breaks *both* caches from the typo on. With {block_size}-token blocks and a "
        f"{prompt_len}-token prompt that differs from a cached one at token {typo_at + 1}, the hash table hands "
        f"back {reuse['hash']} tokens and the radix tree {reuse['radix']}; both compute the {after} tokens from "
        f"the typo on again. {tree} No exact prefix cache can reuse the text after a typo: its K/V differ, "
        "because attention saw the changed token."
    )


def radix_match_code() -> str:
    """The radix tree's lookup, the library's real code (its docstring left out: the words around
    it on the page say the same), as a markdown code block."""
    return code_block(RadixPrefixCache.match)


_GRANULARITY_WORDS = {"token": "every shared token", "block": "whole blocks only",
                      "other": "neither every token nor exactly the whole blocks"}


def granularity_text(match: MatchResult) -> str:
    """What each cache was measured to reuse, with one telling example (a prefix ending inside a block)."""
    inside = [k for k in match.shared_values() if k > match.block_size and k % match.block_size]
    k = inside[-1] if inside else match.shared_values()[-1]
    parts = [f"**{cache}** reused {_GRANULARITY_WORDS[match.granularity(cache)]} "
             f"({match.reused(cache, k)} of {k} shared tokens)" for cache in CACHES]
    agree = sum(p.reused_tokens == predicted_reuse(p.cache, p.shared_tokens, match.block_size, match.prompt_len)
                for p in match.points)
    if match.granularity("hash") == match.granularity("radix") == "token":
        why = (f"With {count(match.block_size, 'token')} per block the two caches matched alike: the "
               "granularity comes from the block size, not from the tree.")
    elif (match.granularity("hash"), match.granularity("radix")) != ("block", "token"):
        why = "That is not what either design predicts: the table shows where the engine differed."
    else:
        why = ("A hash names a *full* block, so a prefix that ends inside a block loses that block's tokens; "
               "this engine's radix tree copies the matching part of that block instead.")
    return (f"Measured with {match.block_size}-token blocks and {match.prompt_len}-token prompts: "
            + "; ".join(parts) + f". {why} The prediction (dotted) and the "
            f"engine agree at {agree} of {len(match.points)} points.")


def granularity_rows(match: MatchResult) -> list[dict[str, int]]:
    return [{"shared": k, "whole_blocks": match.whole_blocks(k),
             **{cache: match.reused(cache, k) for cache in CACHES}} for k in match.shared_values()]


GRANULARITY_COLUMNS = [
    Column("shared", "tokens shared", "int"), Column("whole_blocks", "in whole blocks (tokens)", "int"),
    Column("hash", "hash reused (tokens)", "int"), Column("radix", "radix reused (tokens)", "int"),
]


def granularity_table(match: MatchResult):
    return people_table(granularity_rows(match), GRANULARITY_COLUMNS)


def granularity_figure(match: MatchResult, source: str):
    """Tokens reused vs tokens shared: the prediction of each cache as a dotted staircase (reuse only
    changes at whole tokens), the measurement as markers, block edges in grey."""
    from ...figures import subplots  # defers matplotlib

    fig, ax = subplots(figsize=(6.5, 3.8))
    ks = match.shared_values()
    every = range(max(ks) + 2)  # the prediction at every whole number of shared tokens, drawn as steps
    for cache, marker, colour in zip(CACHES, ("s", "o"), ("tab:orange", "tab:blue"), strict=True):
        ax.plot(every, [predicted_reuse(cache, k, match.block_size, match.prompt_len) for k in every], ls=":",
                drawstyle="steps-post", color=colour, label=f"{cache} (predicted)")
        ax.plot(ks, [match.reused(cache, k) for k in ks], marker=marker, ls="none", color=colour,
                label=f"{cache} (measured)")
    top = max(ks)
    for edge in range(match.block_size, top + 1, match.block_size):
        ax.axvline(edge, color="gray", lw=0.5, alpha=0.5)
    ax.set(xlabel="tokens the second prompt shares with the first", ylabel="prompt tokens reused from the cache",
           xlim=(0, top + 1), ylim=(0, top + 1))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title(f"What each cache matches (block size {match.block_size}, grey lines: block edges)\n{source}",
                 fontsize=10)
    fig.tight_layout()
    return fig
