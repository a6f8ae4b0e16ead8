"""Config sections, one pydantic model each; job.py puts them together and validates across them."""
