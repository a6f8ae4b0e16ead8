"""The sharded weight push (common/transport/plan.py, rule 2): every learner rank that holds a part of
the weights broadcasts that part straight from where it lies, and each receiver puts the full
parameters together.

Sources. Under ZeRO-3 each of the S learner ranks holds, for every parameter of n elements, the
flat partition ``ds_tensor`` of p = ceil(n / S) elements: rank r holds elements [r·p, (r+1)·p)
of the flat parameter, the last ranks' tails padded (DeepSpeed's ``_partition_param``; a rank
whose range starts past n holds only padding). Under ZeRO-1/2 (or one rank) learner rank 0 holds
every parameter whole: S = 1, p = n. ``partition_numel`` is that rule; the learner checks every
partition against it before a byte moves.

The plan. Every source computes the same plan from the parameters' names, shapes and wire dtype
(``plan_rounds``): consecutive parameters of one dtype are grouped into rounds of at most
``bucket_mb`` of full parameters; in round k each source's segment holds its partitions of the
round's parameters back to back (parameter i at element offset o_i, p_i elements each). Rank 0
publishes the plan once per version in the group's store as checked JSON (``encode_plan`` /
``decode_plan``); nothing else crosses the store during the transfer.

The wire. Round k is S broadcasts, one per source, each over that source's own group (the
source and the receivers: common/transport/broadcast.py), so the S run at the same time: each
source's segment goes out from the partitions themselves when they lie back to back in one
storage (DeepSpeed keeps a rank's partitions in flat buffers: no copy at all), else packed into
one of two persistent buffers (alternating, refilled only after the broadcast that last read
it). A receiver posts the S broadcasts of round k into the S rows of a round buffer [S, segment]
(two persistent ones, alternating) and, while round k is on the wire, puts round k-1's
parameters together: parameter i is rows[:, o_i : o_i + p_i] read row after row, cut at n_i
elements; written straight into the loader's destination where the loader offers one
(``ParameterLoader.target``), else into a temporary tensor handed to the loader.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import torch

from stabledrl.common.transport.store import DTYPES, MAX_META_BYTES


def partition_numel(numel: int, sources: int) -> int:
    """Elements of each source's partition of a parameter of ``numel`` elements (ZeRO-3: ceil)."""
    return -(-numel // sources)


@dataclass(frozen=True)
class Piece:
    name: str
    shape: tuple[int, ...]
    offset: int  # element offset of this parameter's partition inside each source's segment

    @property
    def numel(self) -> int:
        out = 1
        for s in self.shape:
            out *= s
        return out


@dataclass(frozen=True)
class Round:
    dtype: torch.dtype
    segment: int  # elements of each source's segment
    pieces: tuple[Piece, ...]


def plan_rounds(params: Sequence[tuple[str, tuple[int, ...], torch.dtype]], sources: int,
                bucket_bytes: int) -> list[Round]:
    """Rounds of consecutive parameters of one dtype, each at most ``bucket_bytes`` of all the
    sources' segments together (a parameter larger than that is a round of its own)."""
    rounds: list[Round] = []
    pieces: list[Piece] = []
    dtype, used = None, 0
    for name, shape, dt in params:
        part = partition_numel(_numel(shape), sources)
        itemsize = torch.empty((), dtype=dt).element_size()
        if pieces and (dt != dtype or (used + part) * itemsize * sources > bucket_bytes):
            rounds.append(Round(dtype, used, tuple(pieces)))
            pieces, used = [], 0
        dtype = dt
        pieces.append(Piece(name, tuple(int(s) for s in shape), used))
        used += part
    if pieces:
        rounds.append(Round(dtype, used, tuple(pieces)))
    return rounds


def encode_plan(rounds: list[Round], sources: int) -> bytes:
    return json.dumps([sources, [[str(r.dtype).removeprefix("torch."), r.segment,
                                  [[p.name, list(p.shape), p.offset] for p in r.pieces]] for r in rounds]]).encode()


def decode_plan(data: bytes, what: str) -> tuple[int, list[Round]]:
    """The inverse of ``encode_plan``, checked: every partition lies inside its segment, the
    dtypes are plain tensor dtypes; ValueError naming ``what`` for anything else."""
    if len(data) > MAX_META_BYTES:
        raise ValueError(f"{what}: plan of {len(data)} bytes (at most {MAX_META_BYTES})")
    try:
        sources, raw = json.loads(data)
    except (UnicodeDecodeError, ValueError, TypeError):
        raise ValueError(f"{what}: the plan is not [sources, rounds] JSON") from None
    if not (_is_int(sources) and sources >= 1 and isinstance(raw, list)):
        raise ValueError(f"{what}: the plan must be [sources >= 1, rounds]")
    rounds = []
    for entry in raw:
        ok = isinstance(entry, list) and len(entry) == 3 and entry[0] in DTYPES and _is_int(entry[1])
        ok = ok and isinstance(entry[2], list)
        if not ok:
            raise ValueError(f"{what}: malformed round {str(entry)[:200]}")
        pieces = []
        for p in entry[2]:
            ok = isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and isinstance(p[1], list)
            ok = ok and all(_is_int(s) for s in p[1]) and _is_int(p[2])
            if not ok:
                raise ValueError(f"{what}: malformed parameter entry {str(p)[:200]}")
            piece = Piece(p[0], tuple(p[1]), p[2])
            if piece.offset + partition_numel(piece.numel, sources) > entry[1]:
                raise ValueError(f"{what}: {piece.name} {list(piece.shape)} at offset {piece.offset} does not fit "
                                 f"the segment of {entry[1]} elements")
            pieces.append(piece)
        rounds.append(Round(DTYPES[entry[0]], entry[1], tuple(pieces)))
    return sources, rounds


def segment_view(parts: Sequence[torch.Tensor], dtype: torch.dtype, device: torch.device) -> Optional[torch.Tensor]:
    """One flat tensor over ``parts`` when they lie back to back in one storage, in ``dtype`` on
    ``device`` (the segment can go out from them with no copy); None otherwise."""
    first = parts[0]
    if first.device != device or any(t.dtype != dtype or t.device != device or not t.is_contiguous() for t in parts):
        return None
    storage, itemsize = first.untyped_storage(), first.element_size()
    expected = first.data_ptr()
    for t in parts:
        if t.untyped_storage().data_ptr() != storage.data_ptr() or t.data_ptr() != expected:
            return None
        expected += t.numel() * itemsize
    total = sum(t.numel() for t in parts)
    return torch.empty(0, dtype=dtype, device=device).set_(storage, first.storage_offset(), (total,))


Loader = Callable[[list[tuple[str, torch.Tensor]]], None]


def assemble(rows: torch.Tensor | Sequence[torch.Tensor], rnd: Round, sources: int, loader: Loader) -> None:
    """Put round ``rnd``'s parameters together from ``rows`` [sources, segment] (row r: source
    r's segment) and hand them to ``loader``: into its destinations where it offers them
    (``loader.target(name, shape)``), else as new tensors. ``rows`` may also be a list of S
    separate rows (each source's segment in memory of its own, read where it lies: a peer pull,
    common/transport/peer.py): each piece is then copied row by row, one contiguous copy each."""
    target = getattr(loader, "target", None)
    separate = not isinstance(rows, torch.Tensor)
    first = rows[0]
    loose: list[tuple[str, torch.Tensor]] = []
    for piece in rnd.pieces:
        numel, part = piece.numel, partition_numel(piece.numel, sources)
        if sources == 1:  # the parameter lies whole in the one row: a view
            loose.append((piece.name, first[piece.offset: piece.offset + numel].view(piece.shape)))
            continue
        dest = target(piece.name, piece.shape) if target is not None else None
        if dest is None or not dest.is_contiguous():
            dest, own = torch.empty(piece.shape, dtype=first.dtype, device=first.device), True
        else:
            own = False
        flat = dest.view(-1)
        if separate:
            for r in range(-(-numel // part)):  # the sources that hold any of it (the last may hold less)
                n = min(part, numel - r * part)
                flat[r * part: r * part + n].copy_(rows[r][piece.offset: piece.offset + n])
        else:
            cols = rows[:, piece.offset: piece.offset + part]
            whole, rest = divmod(numel, part)
            if whole:
                flat[: whole * part].view(whole, part).copy_(cols[:whole])
            if rest:
                flat[whole * part:].copy_(cols[whole, :rest])
        if own:
            loose.append((piece.name, dest))
    if loose:
        loader(loose)


def iter_segments(rounds: list[Round], partitions: Iterator[tuple[str, tuple[int, ...], torch.Tensor]],
                  sources: int) -> Iterator[tuple[Round, list[torch.Tensor]]]:
    """(round, this source's partitions of its parameters, in order), checking every partition's
    name and element count against the plan."""
    for rnd in rounds:
        parts = []
        for piece in rnd.pieces:
            name, shape, tensor = next(partitions)
            part = partition_numel(piece.numel, sources)
            if name != piece.name or tuple(shape) != piece.shape or tensor.numel() != part:
                raise ValueError(f"weight push: partition {name} {list(shape)} of {tensor.numel()} elements where the "
                                 f"plan has {piece.name} {list(piece.shape)} in {sources} partitions of {part}")
            parts.append(tensor.reshape(-1))
        yield rnd, parts


def _numel(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
