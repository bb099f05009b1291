"""Training library for vanilla-transformer (never copied to the Hub)."""
