"""What each party runs, whoever coordinates: its node (one message at a time, each checked against its
declaration and the party's policy), the context its handlers see, the handler declarations a method's party side
is made of, the policy, and the coordinator's port (:mod:`vflo.party.port`: what a method may ask of the
coordinating side).

It sits below alignment and the methods, which declare their handlers with it and drive the port; the
coordinator's side (:mod:`vflo.federation`), which implements the port, sits above them.
"""
