"""Region features: one home for reading, writing, extracting and converting them."""
