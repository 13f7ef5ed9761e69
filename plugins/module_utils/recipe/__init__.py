"""The recipe: one YAML file per served configuration (recipes/NAME.yml).

- ``schema``: the schema as data (``RECIPE_SPEC``, ``RECIPE_SCHEMA``) and the
  patterns and constants the checks and the render share.
- ``validate``: ``validate_recipe`` (the schema, the ``*_from`` variables, the
  files of the recipes folder, the checks across fields), ``variables_named``
  and ``validate_for_cluster``.
- ``render``: ``render_rank`` (one rank's container, command line,
  environment, ports, mounts), ``render_engine_args``, ``render_mounts`` and
  ``engine_endpoints``.

Import from the module that holds a name. tools/recipe-docs.py writes
recipes/README.md and recipes/recipe.schema.json from the schema. Pure
standard library: the package also runs on the nodes, which have no pyyaml.
"""
