"""Identity leakage: which people a party learns are another party's customers, patients or clients.

Threat model: an honest-but-curious party reading the IDs in the clear that reach it (the message
declarations say which fields carry IDs). What matters is the people it did not already know: a party
learning that someone it holds is also held by a partner learns the intersection, which alignment exists
to find; learning about people it does not hold at all is exposure beyond the intersection.

* Entity Augmentation with ``ids = 'clear'`` (the paper): every guest sends the host all its IDs.
* Plain alignment: the active party sends every passive party all of its own IDs.
* Private set intersection: only blinded IDs cross, and the intersection is what is learnt.
"""

from __future__ import annotations

import numpy as np


def exposure(received: np.ndarray, own: np.ndarray, sender_holds: np.ndarray) -> dict[str, float]:
    """Of the sender's people the receiver does not hold, the share whose IDs reached the receiver; and how
    many of the receiver's own people it learnt the sender holds (the intersection)."""
    received_set, own_set, held = set(received.tolist()), set(own.tolist()), set(sender_holds.tolist())
    outside = held - own_set
    exposed = outside & received_set
    return {"outside_people": float(len(outside)), "exposed": float(len(exposed)),
            "exposed_fraction": len(exposed) / len(outside) if outside else 0.0,
            "intersection_learnt": float(len(held & own_set & received_set))}
