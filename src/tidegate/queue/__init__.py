"""The durable priority queue: one API, SQLite (embedded) and Redis backends chosen by URL."""

from tidegate.queue.base import (
    LevelStats,
    MaintenanceReport,
    NewJob,
    Queue,
    QueueSettings,
    QueueStats,
)

__all__ = ["LevelStats", "MaintenanceReport", "NewJob", "Queue", "QueueSettings", "QueueStats"]
