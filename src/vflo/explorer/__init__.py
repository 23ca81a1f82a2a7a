"""``vflo explore``: a partner's columns scored against the label holder's label before training, privately
(weight of evidence and information value per column from per-bin sums of encrypted labels); ``vflo.explore``
is :func:`vflo.explorer.run.explore`."""
