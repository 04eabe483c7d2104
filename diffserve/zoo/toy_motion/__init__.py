"""The toy video model (``toy-motion``, shipped in ``diffserve/assets/toy-motion``): a
tiny Wan2.1 trained on CPU to animate coloured shapes.

``grammar`` holds the prompt grammar and the procedural clip drawer; ``checker`` reads a
clip back (colours, shape, the object's track and direction); ``wan_flow`` is Wan's
flow-matching objective with the prompt's padding folded into one attention bias;
``text`` is the frozen UMT5 whose heads look at neighbours, and its tokenizer; ``vae``
trains the VAE (per frame, then inflated to 4x temporal compression); ``train`` trains
the transformer and writes the pipeline directory; ``evaluate`` scores a model on
held-out prompt/seed pairs through the public ``Engine``. Heavy imports live inside
functions.
"""
