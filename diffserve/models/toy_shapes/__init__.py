"""The shipped toy model (``toy-shapes``): a tiny FLUX.1 trained on CPU to draw coloured shapes.

``grammar`` holds the prompt grammar, the procedural drawer and the checker; ``train`` trains the
VAE and the transformer and writes the pipeline directory. Heavy imports live inside functions.
"""
