"""The repository's development tools, run from a checkout: ``python -m tools COMMAND``.

Not part of the kvtier wheel (docs/decisions.md W1): they read and write the checkout they find
(:mod:`tools.checkout`) — the spec and its validator (:mod:`tools.spec`), the table generator
(:mod:`tools.specgen`), the diagrams, state pages, scenario charts and review page
(:mod:`tools.diagrams`, :mod:`tools.statecharts`, :mod:`tools.seqchart`, :mod:`tools.scenarios`,
:mod:`tools.reviewdoc`), the generated doc tables (:mod:`tools.docgen`), the ``transitions``
reference interpreter (:mod:`tools.reference`), the model checker (:mod:`tools.modelcheck`) and
its planted bugs (:mod:`tools.planted`) — plus what the other development layers share: the
child-process helper (:mod:`tools.child`) and deterministic block contents (:mod:`tools.blocks`).
The layers and what each may import: docs/design.md, *Layers*.
"""
