"""The decode loop: a request is a job (``job``) that drafts a tree (``drafter``, ``budget``,
``draft_tree``), has it verified in a forward (``forward``: the model interface the loop calls),
walks the accepted path (``verify``, ``sampling``, ``grammar_masks``), commits and stops
(``stopping``); ``engine`` steps many jobs through one forward and keeps prompt blocks across
requests (``prefix_cache``). Imports ``toolspec.calls`` only."""
