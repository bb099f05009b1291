"""Model folders made for the Hub: written and checked, their model card, the upload, older folders refreshed."""
