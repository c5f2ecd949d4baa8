"""Integrations of softmax_ext with third-party model libraries (each an
optional dependency, imported only when used):

- softmax_ext.integrations.transformers: Hugging Face transformers models.
"""
