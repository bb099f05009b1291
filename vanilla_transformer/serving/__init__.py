"""Using a trained model: the command-line translator, attention maps, the demo and its Space, translation through
CTranslate2."""
