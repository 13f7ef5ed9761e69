"""The recipe: one YAML file per served configuration (recipes/NAME.yml).

- ``schema``: the schema as data (``RECIPE_SPEC``, ``RECIPE_SCHEMA``) and the
  patterns and constants the checks and the render share.
- ``validate``: the entry points, ``validate_recipe`` (the schema, the
  ``*_from`` variables, the files of the recipes folder, the checks across
  fields), ``variables_named``, ``validate_for_cluster`` and
  ``file_expectation_problems``; the work is in the two modules below.
- ``walk``: the schema walked (types, forms, unknown keys, defaults) and the
  ``*_from`` fields resolved; ``message`` and ``show`` word every problem.
- ``checks``: the checks beyond the schema: across fields, the engine's
  flags, the files the recipe names, the cluster it runs on.
- ``render``: ``render_rank`` (one rank's container, command line,
  environment, ports, mounts), ``render_engine_args``, ``render_mounts`` and
  ``engine_endpoints``.
- ``load``: ``load_recipe_file`` (the file parsed, with the line of every
  key; YAML errors, empty files, non-mappings and doubled keys refused with
  the file, line and column) and ``locate`` (the file and line put into the
  validation's messages). Only this module needs PyYAML, imported when used.
- ``suggest``: close matches for unknown keys and for engine flags one letter
  off the ones sparkserve sets, and precise fixes for values that miss their
  pattern (a short digest, a capital in a commit or an image's path).

Import from the module that holds a name (validate's entry points from validate). tools/recipe-docs.py writes
recipes/README.md and recipes/recipe.schema.json from the schema. Pure
standard library but ``load``: the package also runs on the nodes, which may
have no pyyaml.
"""
