"""The registries, one per axis: kernel backends, model families, executors, serving
fronts.

Each is a small table of names (with their accepted spellings) pointing at
``"module:attr"`` targets that are imported only when chosen. They sit below ``config``
so the resolver derives its allowed values, did-you-mean hints and model defaults from
the same tables the runtime loads from: adding a backend, a model family or an executor
is one entry here plus its implementation, and config follows.
"""
