"""Software policies of the three companion papers, which have no RTL: expert offloading
(:mod:`.offload`), BuddyMoE substitution (:mod:`.buddy`), MoE-Prism sub-experts
(:mod:`.prism`) and QoS serving (:mod:`.qos`), Speculative MoE (:mod:`.speculative`).

They sit beside the golden models of the hardware blocks (:mod:`fsedp.sw`), never below
them: a policy may use a golden model, a golden model never uses a policy.
"""
