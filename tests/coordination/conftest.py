from tests.support.zookeeper import zk_chroot, zookeeper  # noqa: F401
