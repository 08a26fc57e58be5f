"""ICL lab: small models trained on in-context linear regression, and the papers' experiments on them."""
