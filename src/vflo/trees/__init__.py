"""Gradient-boosted trees' pieces that know nothing of parties: binning, histograms and split gains, the tree
structure, and the homomorphic-encryption backends the vertical protocol (:mod:`vflo.methods.secureboost`)
sends gradients under."""
