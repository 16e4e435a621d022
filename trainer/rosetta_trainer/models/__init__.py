"""Models and tokenizers built or loaded, and the losses over their outputs: the bottom floor."""
