"""HTTP routes, one router per resource. Each route is a thin call into
:class:`coordinator.service.JobService`; errors are mapped in :mod:`coordinator.app`."""
