"""Using a trained model: the command-line translator, attention maps, the demo and its Space, the exports to
CTranslate2 and Marian."""
