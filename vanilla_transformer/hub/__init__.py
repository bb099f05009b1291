"""Model folders made for the Hub: written and checked, their model card, the upload, published models converted
into them, older folders refreshed."""
