"""Translation pairs from files, the Hub or the embedded toy task, prepared (tokenized, filtered, cached) or streamed,
the tokenizer, and token-based batches."""
