"""The pool service: one pool shared by the flow runs of many processes, over HTTP."""
