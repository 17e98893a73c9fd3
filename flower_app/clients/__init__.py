"""NumPyClient implementations and the Message-API adapter that drives them."""
