"""The library's version, written into every manifest and export (``shardload.__version__``)."""

VERSION = "0.1.0"
