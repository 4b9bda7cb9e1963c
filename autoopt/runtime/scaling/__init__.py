"""Loss scaling without touching the loop: fp16 dynamic scaling, seeding every backward at its root,
and stepping aside for the user's own AMP."""
