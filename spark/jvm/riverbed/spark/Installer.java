package riverbed.spark;

import java.util.ArrayList;
import java.util.List;

import org.apache.spark.sql.ExperimentalMethods;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.classic.SparkSession;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Adds {@link ColumnPruning} to a live session's {@code experimental().extraOptimizations}.
 *
 * <p>Python (riverbed_spark/pruning.py) loads this jar in a class loader of its own, child of
 * Spark's, and calls {@link #install} through Py4J: nothing has to be on the driver's class path
 * when the session starts. Each load is a new class, so a rule already there is recognized by
 * its class name and source name, not by its class.
 */
public final class Installer {
  private static final Object LOCK = new Object();

  public Installer() {}

  /**
   * Into the calling thread's active session and the default session (the one
   * {@code SparkSession.builder.getOrCreate()} returns), whichever exist: what
   * {@code spark.dataSource.register} on the driver most likely registered with.
   */
  public void installIntoActiveAndDefault(String sourceName) {
    for (scala.Option<SparkSession> session :
        List.of(SparkSession.getActiveSession(), SparkSession.getDefaultSession())) {
      if (session.isDefined()) {
        install(session.get(), sourceName);
      }
    }
  }

  /** True if the rule was added, false if the session already has it. */
  public boolean install(SparkSession session, String sourceName) {
    synchronized (LOCK) {
      ExperimentalMethods experimental = session.experimental();
      List<Rule<LogicalPlan>> rules =
          new ArrayList<>(CollectionConverters.asJava(experimental.extraOptimizations()));
      ColumnPruning pruning = new ColumnPruning(sourceName);
      for (Rule<LogicalPlan> rule : rules) {
        if (rule.ruleName().equals(pruning.ruleName())) {
          return false;
        }
      }
      rules.add(pruning);
      experimental.extraOptimizations_$eq(CollectionConverters.asScala(rules).toSeq());
      return true;
    }
  }
}
