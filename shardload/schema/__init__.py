"""The schema layer: what a sample is, above the base and below everything that stores or reads one.

* ``fields``: :class:`Schema` and :class:`Field`, the named fields of a sample, their dtypes and shapes.
* ``text``: text fields (one ``str`` or ``bytes`` value per sample, stored as its bytes).
* ``cast``: the one rule for changing a field's dtype (never a silent change of value).

``shardload.schema.Schema`` and the other names of the 0.1.0 module ``shardload.schema``
are re-exported here.
"""

from __future__ import annotations

from shardload.schema.fields import (
    CU_SEQLENS_KEY,
    DOCUMENT_IDS_KEY,
    LENGTHS_SUFFIX,
    MAX_DIMS,
    MAX_NAME_BYTES,
    MAX_ROW_ELEMENTS,
    MAX_SEQLEN_KEY,
    POSITION_IDS_KEY,
    SAMPLE_ID_KEY,
    SUPPORTED_DTYPES,
    WEIGHT_KEY,
    Field,
    Schema,
    as_array,
    dtype_name,
    lengths_key,
    name_problem,
    parse_dtype_overrides,
    prepare_problems,
    schema_problems,
)

__all__ = [
    "CU_SEQLENS_KEY",
    "DOCUMENT_IDS_KEY",
    "LENGTHS_SUFFIX",
    "MAX_DIMS",
    "MAX_NAME_BYTES",
    "MAX_ROW_ELEMENTS",
    "MAX_SEQLEN_KEY",
    "POSITION_IDS_KEY",
    "SAMPLE_ID_KEY",
    "SUPPORTED_DTYPES",
    "WEIGHT_KEY",
    "Field",
    "Schema",
    "as_array",
    "dtype_name",
    "lengths_key",
    "name_problem",
    "parse_dtype_overrides",
    "prepare_problems",
    "schema_problems",
]
