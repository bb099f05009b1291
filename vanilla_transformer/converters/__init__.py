"""Foreign formats in and out: published Transformers converted into model folders of this project, and our models
exported to other engines and classes.

In: `convert.py` (the `convert` function: a source read, our model built and checked, the folder written), with
`core.py` (the `Source` a reader makes, `ConversionError`, our model built from a Source and checked against the
source's own), `untrusted.py` (a source's files read with size limits, the Hub download), one reader a format
(`marian.py` for OPUS-MT, `fsmt.py`, `fairseq.py`; `transformers_folder.py` what the first two share), `card.py` (the
converted folder's README.md) and `output_folder.py` (where `convert` may write).

Out: `export_ctranslate2.py` (CTranslate2) and `export_marian.py` (transformers' MarianMTModel).
"""
