"""Recipes: pipelines as TOML files, checked as a whole and run like a build tool."""
