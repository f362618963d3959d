"""``paramserver.sklearn``: the import path of ``PSClassifier``, a scikit-learn estimator
(its code is in ``integrations/sklearn.py``)."""

from paramserver.integrations.sklearn import PSClassifier

__all__ = ["PSClassifier"]
