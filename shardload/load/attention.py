"""Attention that stays inside each document of a packed batch: masks built from ``batch["document_ids"]``.

A packed batch (docs/loading.md, "Packed batches") lays several documents end
to end in each of its ``R`` rows of ``P`` tokens; ``document_ids`` ``[R, P]``
says whose each token is (``-1`` on padding). The rule every helper here
builds, for one query token ``q`` and one key token ``k`` of the batch:

* a document's token attends to the tokens of its own document up to itself
  (block-diagonal and causal: never across documents, never into padding);
* a padding token attends to itself only, so that no row of a mask is empty
  (an empty row is NaN out of the softmax, and a NaN survives a ``* 0``).

One helper per kernel:

* ``F.scaled_dot_product_attention``: :func:`document_causal_mask`, ``[R, 1, P, P]``
  boolean or additive;
* FlexAttention over the rows flattened into one sequence of ``R * P``:
  :func:`document_mask_mod` (the ``mask_mod``), :func:`document_block_mask`
  (the ``BlockMask``; torch 2.5 or later);
* varlen kernels (FlashAttention's ``flash_attn_varlen_func``): no mask, the
  batch already carries the arguments, ``batch["cu_seqlens"]`` and
  ``batch["max_seqlen"]`` (read it with ``int()`` on the CPU, or pass ``P``).

Part of the loading side because it reads the packed batch contract that
``collate_packed`` writes; torch only, no plan, no file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from shardload.errors import InputError, MissingDependencyError

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

#: ``mask_mod(batch, head, q_idx, kv_idx) -> bool``, FlexAttention's signature
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _checked(document_ids: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(document_ids, torch.Tensor) or document_ids.ndim != 2:
        shape = tuple(document_ids.shape) if isinstance(document_ids, torch.Tensor) else type(document_ids).__name__
        raise InputError(
            f"{what}: document_ids must be a packed batch's batch['document_ids'], a [R, P] tensor; got {shape}"
        )
    if document_ids.dtype.is_floating_point or document_ids.dtype == torch.bool:
        raise InputError(f"{what}: document_ids must hold integers, got {document_ids.dtype}")
    return document_ids


def document_causal_mask(document_ids: torch.Tensor, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The ``attn_mask`` of ``F.scaled_dot_product_attention`` over a packed batch: ``[R, 1, P, P]``.

    Block-diagonal and causal: a token attends to the earlier tokens of its
    own document and to itself; a padding token (``document_ids == -1``)
    attends to itself only, so that every row of the mask allows one key at
    least and the output is finite everywhere.

    Args:
        document_ids: ``batch["document_ids"]``, ``[R, P]`` integers (``-1`` on padding).
        dtype: ``torch.bool`` (``True`` = may attend), or a floating dtype for an
            additive mask (``0.0`` = may attend, ``-inf`` = may not), e.g. the
            dtype of ``q``.

    Returns:
        The mask on ``document_ids``'s device; its dimension 1 broadcasts over heads.

    >>> doc = torch.tensor([[0, 0, 1, -1]])
    >>> document_causal_mask(doc)[0, 0].int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 0, 1, 0],
            [0, 0, 0, 1]], dtype=torch.int32)
    """
    doc = _checked(document_ids, "document_causal_mask")
    if dtype != torch.bool and not dtype.is_floating_point:
        raise InputError(f"document_causal_mask: dtype must be torch.bool or a floating dtype, got {dtype}")
    p = doc.shape[1]
    same = doc[:, :, None] == doc[:, None, :]  # [R, P, P]
    causal = torch.ones(p, p, dtype=torch.bool, device=doc.device).tril()
    real = (doc >= 0)[:, :, None]  # [R, P, 1]: the query is a document's token
    pad_self = torch.eye(p, dtype=torch.bool, device=doc.device) & ~real
    allowed = ((same & causal & real) | pad_self)[:, None]  # [R, 1, P, P]
    if dtype == torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=doc.device).masked_fill_(~allowed, float("-inf"))


def document_mask_mod(document_ids: torch.Tensor) -> MaskMod:
    """FlexAttention's ``mask_mod`` over the packed batch's rows flattened into one sequence of ``R * P`` tokens.

    The same rule as :func:`document_causal_mask`, indexed in the flattened
    sequence (documents never cross rows, so the blocks stay inside their
    rows). ``q``, ``k`` and ``v`` are ``[1, H, R * P, D]``. The function
    keeps a reference to the flattened ids: make a new one for each batch.

    >>> mask_mod = document_mask_mod(torch.tensor([[0, 0, -1], [1, 1, 1]]))
    >>> q, kv = torch.arange(6)[:, None], torch.arange(6)[None]
    >>> mask_mod(torch.tensor(0), torch.tensor(0), q, kv).int()[:3]
    tensor([[1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0]], dtype=torch.int32)
    """
    flat = _checked(document_ids, "document_mask_mod").reshape(-1)  # [R * P]

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        doc = flat[q_idx]
        return ((doc == flat[kv_idx]) & (doc >= 0) & (q_idx >= kv_idx)) | (q_idx == kv_idx)

    return mask_mod


def document_block_mask(document_ids: torch.Tensor, *, device: torch.device | str | None = None) -> BlockMask:
    """FlexAttention's ``BlockMask`` of a packed batch: :func:`document_mask_mod` over ``R * P`` tokens.

    Pass it as ``flex_attention(q, k, v, block_mask=...)`` with ``q``, ``k``,
    ``v`` of shape ``[1, H, R * P, D]`` (the rows flattened). Made once per
    batch (the documents differ between batches), on ``device`` (default:
    that of ``document_ids``).

    Raises:
        MissingDependencyError: the installed torch has no FlexAttention (it came in torch 2.5).
    """
    doc = _checked(document_ids, "document_block_mask")
    try:
        from torch.nn.attention.flex_attention import create_block_mask
    except ImportError as e:
        raise MissingDependencyError(
            f"document_block_mask needs FlexAttention (torch 2.5 or later; this is torch {torch.__version__}): "
            "upgrade torch, or use document_causal_mask with F.scaled_dot_product_attention"
        ) from e
    n = doc.numel()
    return create_block_mask(document_mask_mod(doc), None, None, n, n, device=device or doc.device)
