"""``audit watch``: live policies over live state, acted on in steps (notify, then cancel)."""
