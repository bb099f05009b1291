"""Foreign formats in and out: published Transformers (OPUS-MT, FSMT, fairseq) converted into model folders of this
project (`convert.py`), and our models exported to CTranslate2 (`export_ctranslate2.py`) and to transformers'
MarianMTModel (`export_marian.py`)."""
