"""Stage 3 · Paged KV: a reference solution."""

import torch


def paged_slots(block_table: list[int], block_size: int, start: int, count: int) -> list[int]:
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def online_softmax_update(running_max: torch.Tensor, running_sum: torch.Tensor, output_acc: torch.Tensor,
                          scores: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
    correction = torch.exp(running_max - new_max)  # exp(-inf) = 0 on the first tile
    probs = torch.exp(scores - new_max)
    new_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
    new_acc = output_acc * correction + probs @ values
    return new_max, new_sum, new_acc


class PagedKVStore:
    """Every layer's K and V in blocks of ``block_size`` slots, read one block (a tile) at a time."""

    def __init__(self, num_blocks: int, block_size: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        self.block_size = block_size
        self.k = torch.zeros(layers, num_blocks * block_size, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def slots(self, block_table: list[int], start: int, count: int) -> list[int]:
        return paged_slots(block_table, self.block_size, start, count)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, slots] = k.to(self.k.dtype)
        self.v[layer, slots] = v.to(self.v.dtype)

    def attend(self, layer: int, q: torch.Tensor, block_table: list[int], context_len: int,
               scale: float) -> torch.Tensor:
        n, heads, d = q.shape
        dtype, group = q.dtype, heads // self.k.shape[2]
        bs = self.block_size
        q = q.float().transpose(0, 1)  # (heads, n, d), fp32 whatever the store keeps
        query_pos = torch.arange(context_len - n, context_len, device=q.device)  # each query's own position
        running_max = torch.full((heads, n, 1), float("-inf"), device=q.device)
        running_sum = torch.zeros(heads, n, 1, device=q.device)
        output_acc = torch.zeros(heads, n, d, device=q.device)
        for i in range((context_len + bs - 1) // bs):  # one block of the table: a tile of keys
            first, count = i * bs, min(bs, context_len - i * bs)
            slot = block_table[i] * bs  # a block's slots are consecutive: read them in place
            k = self.k[layer, slot:slot + count].float().transpose(0, 1).repeat_interleave(group, dim=0)
            v = self.v[layer, slot:slot + count].float().transpose(0, 1).repeat_interleave(group, dim=0)
            scores = (q @ k.transpose(1, 2)) * scale  # (heads, n, count)
            future = torch.arange(first, first + count, device=q.device)[None, :] > query_pos[:, None]
            scores = scores.masked_fill(future, float("-inf"))
            running_max, running_sum, output_acc = online_softmax_update(running_max, running_sum, output_acc,
                                                                         scores, v)
        return (output_acc / running_sum).transpose(0, 1).to(dtype)

    def copy(self, src_slots: list[int], dst_slots: list[int]) -> None:
        self.k[:, dst_slots] = self.k[:, src_slots]
        self.v[:, dst_slots] = self.v[:, src_slots]
