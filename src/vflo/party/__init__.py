"""What each party runs, whoever coordinates: its node (one message at a time, each checked against its
declaration and the party's policy), the handler declarations a method's party side is made of, and the policy.

It sits below alignment and the methods, which declare their handlers with it; the coordinator's side
(:mod:`vflo.federation`) sits above them.
"""
