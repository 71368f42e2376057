"""What an edge bundle ships beside a model (training.edge builds the bundle): ``predict.py``,
a standalone predictor, and the bundle's ``README.md``."""
