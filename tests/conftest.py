"""Shared test set-up: JAX gets the book's 8 simulated CPU devices before any test runs."""

import scalebook

scalebook.setup(quiet=True)
