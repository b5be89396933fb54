"""Offline training data: SFT / DPO records -> token ids, and the OfflineBatchSource.

Record formats accepted by ``sft_item`` (one JSON object per line):

    {"messages": [...chat so far...], "completion": "<think>..</think><move>B2</move>"}
        chat template applied to the messages; the completion (plus end-of-turn) is trained on
    {"prompt": "...", "completion": "..."}
        with chat=True the prompt is a user message, else raw text (no template)
    {"text": "..."}
        raw text, every token trained on (the ThinkTacToe SFT schema)

SFT is offline RL with weight 1: every record becomes a SAWItem with
``weight=1`` and no sampler log-probs, and ``make_sft`` trains a uniform NLL on
the completion tokens only.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from ludic.data.jsonl import DatasetError, read_jsonl
from ludic.tokenization import encode, encode_raw, render_ids
from ludic.types import SAWBatch, SAWItem


def _eot_ids(tokenizer: Any) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def prompt_ids_for(record: dict[str, Any], tokenizer: Any, chat: bool) -> list[int]:
    """Prompt ids of an SFT/DPO record (chat template for messages, raw text otherwise)."""
    if "messages" in record:
        return render_ids(tokenizer, record["messages"])
    if chat:
        return render_ids(tokenizer, [{"role": "user", "content": record["prompt"]}])
    return encode_raw(tokenizer, record["prompt"])


def completion_ids_for(text: str, tokenizer: Any, chat: bool) -> list[int]:
    return encode(tokenizer, text) + (_eot_ids(tokenizer) if chat else [])


def sft_item(record: dict[str, Any], tokenizer: Any, chat: bool = True) -> SAWItem:
    """One SFT record -> SAWItem(prompt ids, completion ids, weight 1)."""
    if "text" in record:
        bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else [tokenizer.eos_token_id]
        ids = encode(tokenizer, record["text"]) + _eot_ids(tokenizer)
        return SAWItem(tuple(bos), tuple(ids), 1.0, meta={"source": "text"})
    chat = chat or "messages" in record
    return SAWItem(
        tuple(prompt_ids_for(record, tokenizer, chat)),
        tuple(completion_ids_for(record["completion"], tokenizer, chat)),
        float(record.get("weight", 1.0)),
    )


def _check_sft(rec: dict[str, Any]) -> str | None:
    if "text" in rec:
        return None if isinstance(rec["text"], str) and rec["text"] else "'text' must be a non-empty string"
    if "completion" not in rec or not isinstance(rec["completion"], str):
        return "needs 'text', or 'completion' (string) with 'messages' or 'prompt'"
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
        ):
            return "'messages' must be a list of {role, content} objects"
        return None
    if not isinstance(rec.get("prompt"), str):
        return "needs 'messages' (list) or 'prompt' (string) next to 'completion'"
    return None


def load_sft_items(paths: str | Sequence[str], tokenizer: Any, chat: bool = True) -> list[SAWItem]:
    """Read and tokenise SFT JSONL files (bad lines raise naming file and line)."""
    items = []
    for path in [paths] if isinstance(paths, str) else paths:
        for rec in read_jsonl(path, validate=_check_sft):
            items.append(sft_item(rec, tokenizer, chat))
    return items


class OfflineBatchSource:
    """Shuffled, sharded, resumable batches over a fixed list of items.

    Each rank sees a disjoint shard of every epoch's permutation; ``batch_size``
    is per rank. ``state_dict``/``load_state_dict`` let a resumed run continue
    at the same position of the same epoch.
    """

    def __init__(
        self,
        items: Sequence[SAWItem],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        if not items:
            raise ValueError("OfflineBatchSource: no items")
        if batch_size < 1:
            raise ValueError(f"OfflineBatchSource: batch_size must be >= 1, got {batch_size}")
        self.items = list(items)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.drop_last = drop_last
        self.epoch = 0
        self.pos = 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order[self.rank :: self.world_size]

    @property
    def batches_per_epoch(self) -> int:
        n = len(self._epoch_order())
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _take(self) -> list[SAWItem]:
        if self.pos >= len(self._order) or (
            self.drop_last and self.pos + self.batch_size > len(self._order)
        ):
            self.epoch += 1
            self.pos = 0
            self._order = self._epoch_order()
        idx = self._order[self.pos : self.pos + self.batch_size]
        self.pos += len(idx)
        return [self.items[i] for i in idx]

    async def next_batch(self) -> SAWBatch:
        batch = self._take()
        return SAWBatch(items=batch, meta={"epoch": self.epoch, "num_items": len(batch)})

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state["epoch"])
        self.pos = int(state["pos"])
        self._order = self._epoch_order()


__all__ = ["DatasetError", "OfflineBatchSource", "load_sft_items", "sft_item", "prompt_ids_for", "completion_ids_for"]

