"""The costmodel room: the price of one operator or collective on one device (``api.Pricer.predict``).
Its inference side (api, learned, features, roofline, devices, ops, collectives, collective_model, query) never
imports its training side (train, eval, collect, collective_fit, refit, datasets); it imports core only."""
