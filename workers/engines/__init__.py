"""Inference engines behind one small interface, chosen by a model's `backend`."""
