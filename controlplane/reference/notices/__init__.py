"""The reference email app: the notice tasks (plan, send each, record its receipt), the
channels they send through (HTTP provider, SMTP) and the provider's client."""
