"""Recipes: the schema (every key, type and default), the loader (pure: merges a recipe chain from documents it
is handed), the catalog (finds and reads recipe files in their layers) and the registry (signed site recipes)."""
