"""Database plumbing every app may use: the bottom layer, below accounts (see pyproject.toml's
import contracts). It knows no model of its own."""
