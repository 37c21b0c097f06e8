"""What tests check of a Spark session."""


def nothing_cached(spark) -> bool:
    """Whether the session's cache (what stays until unpersisted) is empty: a notebook or
    a scheduler runs audits and validations again and again in one session, and
    whatever one left persisted would add up until the driver ran out of memory.
    Checkpointed frames are not in it: they go when the JVM collects them."""
    return spark._jsparkSession.sharedState().cacheManager().isEmpty()
