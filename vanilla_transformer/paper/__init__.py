"""The paper, figure by figure, drawn by the code that runs.

`measurements.py` computes each figure's numbers with the model file's, the training's and transformers' own
functions, `figures.py` draws them and writes `index.md`, `output.py` is `vanilla-transformer paper-figures`' folder
under the one output-folder rule.

A layer of its own above `serving`: it reads a model folder and draws attention maps through `serving`, and uses the
training's schedule and loss and the data's tokenizer; nothing but the command imports it."""
