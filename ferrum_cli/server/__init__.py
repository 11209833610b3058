"""`ferrum serve`: OpenAI's audio API over HTTP, in front of one long-lived batched engine."""
