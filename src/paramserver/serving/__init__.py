"""``paramserver serve``: an HTTP prediction service over a saved or published CTR model."""
