"""The shipped toy model (``toy-shapes``): a tiny FLUX.1 trained on CPU to draw coloured
shapes.

``grammar`` holds the prompt grammar, the procedural drawer and the checker; ``flow``
the flow-matching objective; ``train`` trains the VAE and the transformer and writes the
pipeline directory; ``lora`` trains its circles-to-stars adapter; ``loss_curve`` draws
the training log. Heavy imports live inside functions.
"""
